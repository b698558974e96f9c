"""fedrepro.reporting"""
