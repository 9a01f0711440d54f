"""The census trainer package, as AI Platform's samples ship theirs."""

from setuptools import find_packages, setup

setup(name="census-trainer", version="0.1", packages=find_packages())
