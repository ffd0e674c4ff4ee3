"""Research studies built on ``mage_rl``: run from a checkout, not installed with the package.

Each study is a folder with its modules, its config, a command-line entry
(``python -m studies.NAME``, from the checkout's root) and a README that says what it
asks, how to run it and where its recorded results are. See ``studies/README.md``.
"""
