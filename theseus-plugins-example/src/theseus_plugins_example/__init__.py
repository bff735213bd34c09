"""An example third-party plugin distribution for theseus."""
