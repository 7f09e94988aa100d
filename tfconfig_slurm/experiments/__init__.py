"""The experiments that ship with the package, run by name: `--experiment mnist_deep`.

Each is an experiment module as process/user_code/experiment.py describes; like the runtime, they
import TensorFlow.
"""
