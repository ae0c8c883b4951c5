"""The engine-core process: owns the model, batches requests from every API server, pools."""
