"""Training helpers shared by the project's training commands (``decoding/train_*.py``)."""
