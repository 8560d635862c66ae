"""The files a user gives (workload specs, cost profiles, traces, results folders), read with errors that name the
file, the line and the column or key (``reader.py``)."""
