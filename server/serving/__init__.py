"""The serving roles: supervisor, ventilator (socket glue), scheduler and worker registry
(policy), workers and the sink."""
