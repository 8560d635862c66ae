"""kvsched routers inside Ray Serve: ``KvschedRequestRouter`` (any ``kvsched.routers`` plugin as Serve's
request router) and a fleet of ``engine serve`` replicas behind it (``fleet``). Needs the ray extra."""
