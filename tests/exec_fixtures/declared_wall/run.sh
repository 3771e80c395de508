#!/usr/bin/env bash
sleep 30
