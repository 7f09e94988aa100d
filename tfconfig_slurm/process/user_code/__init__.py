"""What the user brings: experiments (found, read and loaded), their hparams and sweeps, and the
versions of TensorFlow and Keras installed. No TensorFlow here."""
