"""The Keras 3 backend: keras.distribution on JAX, one process a task, without TensorFlow."""
