"""`kafscale console`: a web console for a KafScale (or any Kafka) cluster, run as a
separate process that speaks the Kafka protocol as a client and reads the brokers'
/metrics.

cluster.py  what the console asks the cluster (AdminClient, Consumer, Producer), bounded
metrics.py  the brokers' ops endpoints: scrapes, rates, readiness
auth.py     users file, sessions, CSRF tokens
web.py      aiohttp application, middleware and views; templates/ and static/ beside it

static/ ships, unchanged from the npm registry, htmx 2.0.11 (htmx.org, 0BSD: htmx.LICENSE)
and uPlot 1.6.32 (uplot, MIT: uPlot.LICENSE); nothing is loaded from a CDN.
"""
