"""One task's life: where it runs (place), its lifecycle from start checks to exit, its settings,
throughput lines, checkpoint cadence, and TensorFlow's start-up notes held. No TensorFlow here."""
