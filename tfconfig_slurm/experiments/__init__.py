"""The experiments that ship with the package, run by name (`--experiment mnist_deep`), each a
module as process/user_code/experiment.py describes."""
