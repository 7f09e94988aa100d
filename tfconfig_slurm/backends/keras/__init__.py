"""The Keras backend (TensorFlow 2.16+ with tf-keras): Model.fit under
MultiWorkerMirroredStrategy, or in one process."""
