"""What a run measured: per-request latencies and the summary, SLO goodput, fairness, time series."""
