"""Where rank 0's scalars go: TensorBoard, a CSV file, MLflow, W&B, behind one small interface (``base``)."""
