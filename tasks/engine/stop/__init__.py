"""The rank's side of a stop: the signal (``signals``), the vote across ranks (``vote``), and the controller that
decides what to save and when (``controller``)."""
