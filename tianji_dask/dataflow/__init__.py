"""Dataflow roles: chunk schema, explorer task, learner actor, staleness controller, weights."""
