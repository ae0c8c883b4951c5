"""The image pipeline: an image from its source (data: URL, http(s), local file, each fetch guarded) to the uint8
pixels the engine takes."""
