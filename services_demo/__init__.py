"""The checkout demo: five small services, one saga, a Kafka trigger.

- ``services_demo.sagas``: the ``checkout`` saga and its Kafka trigger (the engine runs
  it: ``saga worker services_demo.sagas``);
- ``services_demo.orders``, ``payments``, ``inventory``, ``fraud``: FastAPI services
  (``uvicorn services_demo.orders:app``), each with its own Postgres schema and, except
  fraud, the participant kit for its Kafka commands;
- ``services_demo/shipping_go``: the shipping service, in Go with the Go participant kit
  (``kits/go``), which ``services_demo.run`` builds and starts;
- ``services_demo.run``: starts the engine and the services as processes (``make demo-up``);
- ``services_demo.scenario``: the narrated end-to-end scenario (``make demo``).

See ``services_demo/README.md``.
"""
