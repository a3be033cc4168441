"""Running several strategies and timing them: ``runner`` (one prompt, every strategy side by side,
warmed up and synchronised, with the greedy reference) and ``bench`` (prompt sets, repeats, sweeps,
summaries). The commands (``python -m playground``, ``playground/cli.py``) and the web app call these.
"""
