"""Processes watching processes: a command supervised as a task, the watchdog of peers, the port a
task answers on, children, the local cluster and the network checks. No TensorFlow here."""
