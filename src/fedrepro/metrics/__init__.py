"""fedrepro.metrics"""
