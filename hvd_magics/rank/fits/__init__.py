"""A HorovodEstimator's fit on a rank: the model built, each framework's loop, its event
files."""
