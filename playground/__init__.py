"""The applications over the library, a floor beside ``web/``: the command line (``python -m playground
run|bench|list``), the training commands (``python -m playground.train_prophet``, ``...train_consistency``) and
their data (``training/``). ``decoding/`` never imports anything from here."""
