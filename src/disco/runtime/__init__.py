"""The distributed runtime: node plans, shards, transport, launch."""
