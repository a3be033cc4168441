"""Training helpers shared by the project's training commands (``playground/train_*.py``)."""
