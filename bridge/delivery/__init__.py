"""Deciding and delivering the changes of one resource: what counts as a change
(changes, views, filters), the envelope (events), the synchronous core that
orders sends and commits (outbox), the per-resource pipeline that runs them,
and the events that are not changes (heartbeats, snapshots)."""
