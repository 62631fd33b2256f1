"""The compile program and what it is made of: ahead-of-time compilation, the compile
report, decode compilation, the maximum-batch search and saved compiled steps.
"""
