"""fedrepro.data"""
