"""Resumable streams: a stream cut by a replica's shutdown goes on on another replica.

ids.py: the stream key and the event ids (the resume points); record.py: what the cut replica
writes (prompt, tokens, sampling, generator state), as strictly validated JSON; records.py: the
records in the shared store, their signatures and expiry.
"""
