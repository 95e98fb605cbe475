"""``k8s-bridge mirror``: keeps a PostgreSQL database equal to the clusters' state.

settings (the mirror's YAML), sources (Kafka, JetStream from stored positions),
rows (events to rows, a batch's winners), schema (tables and the batch SQL),
store (PostgreSQL: ownership, positions, one transaction per batch), runner
(the loop). docs/mirror.md describes the tables and the guarantees.
"""
