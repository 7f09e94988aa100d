"""The process machinery, free of TensorFlow: where a task runs, what it checks before it
starts, the run directory and its lock, reports, signals and requeue, supervision and the
watchdog, the local cluster, and which TensorFlow and experiment a run has."""
