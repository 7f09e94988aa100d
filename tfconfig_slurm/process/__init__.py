"""The process machinery, free of TensorFlow: a task's place and checks, the run's records,
the job (signals, requeue), supervision, and the user's code."""
