"""The run directory and what a run keeps there: its lock, state.json, reports, failure and
refusal records. No TensorFlow here."""
