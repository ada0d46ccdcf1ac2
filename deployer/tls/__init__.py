"""TLS and basic auth of the monitoring tier (issue 15): the product's CA on the controller
(``ca``), the bcrypt hashes of the basic-auth password (``hashing``), and what one host gets when
``gpumon_tls`` is on (``material``: certificate, key, CA, the exporter-toolkit web config, the
clients' settings). The roles read it through the template global ``gpumon_tls_material()``; the product's
own HTTP client through ``deployer.monitoring.http.ClientTLS``.
"""
