"""Real parts for tests and benchmarks: the loopback OpenAI-compatible model server
(:mod:`testkit.fake_openai`) and a gateway started with a fixed token on port 0
(:mod:`testkit.gateway`). It stands on the packages; ``tests/`` and ``bench/`` stand on it."""
