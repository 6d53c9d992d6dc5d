"""Device probes: the peaks measured on this device (peaks.py, open first), a time's position
against them (roofline.py), and the versions a verdict names (versions.py).

Never: a figure read from a datasheet; nothing here runs candidate code.
"""
