"""Everything a person reads live: the bar and its frame (live.py, live_frame.py), a concurrent sweep's view
(sweep_view.py), a run's closing account (closing.py), and text fitted to the terminal (textfit.py). Read by the
supervision session, the launchers and the jobs; it reads only the records and the diagnostics' figures."""
