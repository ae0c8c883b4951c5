"""msgspec types of every HTTP endpoint: they decode requests and encode responses."""
