"""Imported early by a rank (``HVD_MAGICS_PREIMPORT``): it never returns, so the rank never
reports that it started, however fast the machine (a start timeout's test needs that)."""
import threading

threading.Event().wait()
