"""The reliability suite: attacks against a real server, and what they did to it.

``python -m bench.reliability`` runs each attack of ``bench.reliability.attacks`` against a fresh
``duplex serve`` process while a bystander session keeps talking to the same server, and reports,
per attack, the bystander's heartbeat latency (p50/p99/max) and ``/health`` latency, the server's
resident memory before, at its peak and ``settle_s`` after, whether it survived, what the attack
was answered, and a verdict against the attack's targets (``attacks.judge``): heartbeat p99 under
250 ms, memory back within 200 MB, another session's first audio under 3 s, and the attack's own
expected outcome (errors with codes, no growth of ``/metrics``, no secret in the log, partial
headers dropped). The table goes to stdout, everything to ``--json``; ``--plot`` draws each
attack's memory over time.
"""
