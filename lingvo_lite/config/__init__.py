"""The Fiddle edge: experiments registered and imported, overrides and fiddlers applied,
the config checked, built, written to and read from a job dir, drawn and explained.
"""
