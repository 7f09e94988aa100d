"""The run directory and what a run keeps there: its file names, the lock (claim, model_dir),
state.json and the reports, the checkpoint history, failure and refusal records, and the run's
owner. No TensorFlow here."""
