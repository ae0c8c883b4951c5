"""The bench's reusable harness, which the scripts in bench/ and the tests import: the one launcher (server_process),
clients, stats, the prober, scrapes of /metrics, steady load, the corpus, workloads, the tiny models, the machine's
facts and the report's tables and targets. Nothing here is run as a script."""
