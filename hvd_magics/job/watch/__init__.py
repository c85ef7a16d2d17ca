"""The watch of a running job from the driver: its monitors asked each turn and its phase moved
on (:mod:`.loop`), its end judged (:mod:`.outcome`); the monitors and their protocol are in
:mod:`hvd_magics.job.verdicts`, the events' following in :mod:`hvd_magics.job.following`."""
