"""fedrepro.algorithms"""
