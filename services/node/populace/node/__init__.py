"""`populace node`: one daemon per machine that starts, watches, restarts and stops Populace
processes on request over the bus (`node.<node_id>.<verb>`), and registers the machine and
its processes in KV `nodes`."""
