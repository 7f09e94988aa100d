"""The training backends, one folder each (estimator/, keras/): the only code of the package
that imports TensorFlow. tf_process.py is the TensorFlow process both set up and end."""
