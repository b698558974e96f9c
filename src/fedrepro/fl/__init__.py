"""fedrepro.fl"""
