"""Oracles the search is checked against: independent implementations written for the tests only (the
pure-Python reference DP, brute-force enumeration of plans), kept out of the product."""
