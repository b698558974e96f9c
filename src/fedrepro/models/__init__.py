"""fedrepro.models"""
