"""Experiment tracking: TensorBoard, W&B and MLflow metrics sinks, and the run status record.

Importing this package is light (no jax, no tracker package): each tracker module imports its
package only when a run selects it.
"""
