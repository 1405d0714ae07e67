"""`scripts/loadtest`: producers and consumers as separate processes against a node, with live
progress, a verified soak (`--verify`, `--chaos`), and a report (results.json, PNG plots,
report.html). `run` is the coordinator; each other module is one piece of it:

- `params`: the run's parameters, the `--scenario` presets, message-size distributions;
- `payload`: the 32-byte header every load-test body starts with (who sent it, when, its CRC);
- `histogram`: log-bucketed latency histograms the workers merge into the coordinator's;
- `records`: per-message record files the workers append and `verify` reads;
- `verify`: loss, duplicates, corruption, misplacement and order, from the record files alone;
- `workers`: the producer and consumer processes;
- `monitor`: CPU and memory of the node's processes (psutil);
- `chaos`: seeded kill -9 of an actor or the whole node, and the restarts;
- `live`, `report`: the terminal dashboard, the summary table, plots and the HTML page.
"""
