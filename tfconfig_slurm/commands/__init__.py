"""The command-line edges: each command's flags, read here and nowhere below, and the one way
a command starts and fails (cli.py)."""
