"""The Estimator backend (TensorFlow 2.15): parameter servers, trainers and the evaluator of
tf.estimator.train_and_evaluate, and `tfconfig_slurm.train_and_evaluate` for users' scripts."""
