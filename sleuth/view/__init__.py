"""``sleuth view``: a run's or an eval's curves and trajectories in the browser (``cli``, ``app``, ``store``, ``static/``)."""
